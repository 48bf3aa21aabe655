// chongming-redis dashboard: live updates over server-sent events (the change feed).
// The server sends `patch` events: {element id: HTML of that part}; this swaps them in.
// No polling: one EventSource per page, reconnected by the browser.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var source = document.body.getAttribute("data-events");
  function say(text, on) {
    if (!live) return;
    live.textContent = text;
    live.className = "live " + (on ? "on" : "off");
  }
  if (!source) { say("static page", false); return; }
  if (!window.EventSource) { say("no live updates in this browser", false); return; }
  var events = null;
  var ended = false;
  function listen() {
    events = new EventSource(source);
    events.onopen = function () { say("live", true); };
    events.onerror = function () { say("reconnecting…", false); };
    events.addEventListener("patch", function (event) {
      var parts = JSON.parse(event.data);
      Object.keys(parts).forEach(function (id) {
        var element = document.getElementById(id);
        if (!element) return;
        // The first events repeat what the page already shows: parse the new HTML the way
        // the page's was parsed and leave an identical part alone (a button keeps its focus,
        // a click in flight is not lost).
        var parsed = document.createElement("template");
        parsed.innerHTML = parts[id];
        if (parsed.innerHTML !== element.innerHTML) element.innerHTML = parts[id];
      });
      say("live", true);
    });
    events.addEventListener("end", function () {  // nothing more will change: stop listening
      ended = true;
      events.close();
      say("up to date", true);
    });
  }
  listen();
  // A page left for another stays in the back/forward cache with its stream open, holding
  // one of the browser's six connections to this host: six pages on, the next one hangs.
  // Close the stream when the page is hidden; a page restored from the cache listens again
  // (the first events bring every part up to date).
  window.addEventListener("pagehide", function () {
    if (events) { events.close(); events = null; }
  });
  window.addEventListener("pageshow", function (event) {
    if (event.persisted && !events && !ended) { say("connecting…", false); listen(); }
  });
})();
