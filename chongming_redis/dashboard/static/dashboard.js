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
  var events = new EventSource(source);
  events.onopen = function () { say("live", true); };
  events.onerror = function () { say("reconnecting…", false); };
  events.addEventListener("patch", function (event) {
    var parts = JSON.parse(event.data);
    Object.keys(parts).forEach(function (id) {
      var element = document.getElementById(id);
      if (element) element.innerHTML = parts[id];
    });
    say("live", true);
  });
  events.addEventListener("end", function () {  // nothing more will change: stop listening
    events.close();
    say("up to date", true);
  });
})();
