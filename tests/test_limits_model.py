"""The limits model (``chongming_redis.limits``): validation, binding, refs, the recorded JSON and
the token bucket's refill, without any store."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import timedelta

import pytest
from pydantic import BaseModel

from chongming_redis.limits import (
    MAX_CONCURRENCY,
    MAX_KEY_BYTES,
    MAX_LIMITS,
    MAX_PERIOD,
    MAX_RATE,
    BoundLimit,
    Concurrency,
    LimitConflict,
    LimitKeyError,
    RateLimit,
    bind,
    check_refs,
    from_json,
    key_of,
    refill,
    refs_for,
    to_json,
)

BAD_FIELDS = ["1a", "a-b", "", "a b", "a.", ".a", "a..b", "a=b"]
BAD_NAMES = ["", "a b", "a=b", "x" * 101, "é"]

# -- Concurrency ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (MAX_CONCURRENCY + 1, ValueError),
        (True, TypeError),
        (1.5, TypeError),
        ("2", TypeError),
    ],
)
def test_concurrency_max_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"Concurrency\.max"):
        Concurrency(max=value)  # type: ignore[arg-type]


def test_concurrency_accepts_bounds() -> None:
    assert Concurrency(1).max == 1
    assert Concurrency(MAX_CONCURRENCY, per="a.b_c", name="x.Y:1-_").per == "a.b_c"


@pytest.mark.parametrize("per", [*BAD_FIELDS, 3])
def test_concurrency_bad_per_refused(per: object) -> None:
    with pytest.raises(ValueError, match=r"Concurrency\.per"):
        Concurrency(2, per=per)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_concurrency_bad_name_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"Concurrency\.name"):
        Concurrency(2, name=name)


# -- RateLimit --------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0, 0.0, -1, -0.5, math.nan, math.inf, MAX_RATE * 2])
def test_rate_out_of_range_refused(rate: float) -> None:
    with pytest.raises(ValueError, match=r"RateLimit\.rate"):
        RateLimit(rate)


@pytest.mark.parametrize("rate", [True, "1", None])
def test_rate_not_a_number_refused(rate: object) -> None:
    with pytest.raises(TypeError, match=r"RateLimit\.rate"):
        RateLimit(rate)  # type: ignore[arg-type]


@pytest.mark.parametrize("per", [0, -1, math.nan, MAX_PERIOD + 1, timedelta(0)])
def test_rate_bad_per_refused(per: object) -> None:
    with pytest.raises(ValueError, match=r"RateLimit\.per"):
        RateLimit(1, per=per)  # type: ignore[arg-type]


def test_rate_per_timedelta_becomes_seconds() -> None:
    limit = RateLimit(5, per=timedelta(minutes=2))
    assert limit.per == 120.0 and type(limit.per) is float
    assert RateLimit(5, per=timedelta(milliseconds=500)).per == 0.5
    assert type(RateLimit(3).rate) is float


@pytest.mark.parametrize(("rate", "burst"), [(0.5, 1), (0.01, 1), (1, 1), (2.5, 3), (10, 10)])
def test_rate_default_burst(rate: float, burst: int) -> None:
    assert RateLimit(rate).burst == burst


def test_rate_explicit_burst() -> None:
    assert RateLimit(10, burst=3).burst == 3
    with pytest.raises(ValueError, match=r"RateLimit\.burst"):
        RateLimit(10, burst=0)
    with pytest.raises(ValueError, match=r"RateLimit\.burst"):
        RateLimit(10, burst=int(MAX_RATE) + 1)
    with pytest.raises(TypeError, match=r"RateLimit\.burst"):
        RateLimit(10, burst=2.0)  # type: ignore[arg-type]


# Found by this file: the default burst ceil(rate) of a rate near MAX_RATE was refused.
def test_rate_at_max_rate_with_default_burst_is_accepted() -> None:
    RateLimit(MAX_RATE)


@pytest.mark.parametrize("key", BAD_FIELDS)
def test_rate_bad_key_refused(key: str) -> None:
    with pytest.raises(ValueError, match=r"RateLimit\.key"):
        RateLimit(1, key=key)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_rate_bad_name_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"RateLimit\.name"):
        RateLimit(1, name=name)


def test_limits_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Concurrency(1).max = 2  # type: ignore[misc]


# -- bind -------------------------------------------------------------------------------------


def test_bind_ids() -> None:
    bound = bind("send", [Concurrency(2), RateLimit(1), Concurrency(1, name="shared")])
    assert [b.id for b in bound] == ["send.concurrency", "send.rate", "shared"]
    assert all(isinstance(b, BoundLimit) for b in bound)
    assert bound[1].limit == RateLimit(1)
    assert bind("t", []) == ()


@pytest.mark.parametrize("limits", [[Concurrency(1), Concurrency(2, per="a")],
    [RateLimit(1), RateLimit(2)], [Concurrency(1, name="x"), RateLimit(1, name="x")]])  # fmt: skip
def test_bind_duplicate_ids_refused(limits: list[Concurrency | RateLimit]) -> None:
    with pytest.raises(ValueError, match="two limits"):
        bind("t", limits)


def test_bind_named_ones_coexist() -> None:
    bound = bind("t", [Concurrency(1, name="a"), Concurrency(2, name="b"), Concurrency(3)])
    assert [b.id for b in bound] == ["a", "b", "t.concurrency"]


def test_bind_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="dict"):
        bind("t", [{"max": 1}])  # type: ignore[list-item]


def test_bind_refuses_a_task_name_that_makes_a_bad_id() -> None:
    with pytest.raises(ValueError, match="give its limits a name"):
        bind("my task", [Concurrency(1)])
    assert bind("my task", [Concurrency(1, name="ok")])[0].id == "ok"


def test_bind_at_most_max_limits() -> None:
    limits = [Concurrency(1, name=f"c{i}") for i in range(MAX_LIMITS + 1)]
    assert len(bind("t", limits[:MAX_LIMITS])) == MAX_LIMITS
    with pytest.raises(ValueError, match=f"at most {MAX_LIMITS}"):
        bind("t", limits)


# -- refs_for / key_of ------------------------------------------------------------------------


class Inner(BaseModel):
    region: str


class Params(BaseModel):
    customer_id: int
    inner: Inner


@dataclasses.dataclass
class DataParams:
    customer: str
    inner: dict[str, object]


def test_refs_follow_bound_order_and_keys() -> None:
    bound = bind("t", [RateLimit(1, key="a.b"), Concurrency(1), Concurrency(2, per="c", name="n")])
    assert refs_for(bound, {"a": {"b": "x"}, "c": 7}) == ("t.rate=x", "t.concurrency", "n=7")
    assert refs_for(bind("t", [Concurrency(1)]), None) == ("t.concurrency",)


def test_refs_from_pydantic_model_and_dataclass() -> None:
    bound = bind("t", [Concurrency(1, per="customer_id"), RateLimit(1, key="inner.region")])
    assert refs_for(bound, Params(customer_id=7, inner=Inner(region="eu"))) == (
        "t.concurrency=7",
        "t.rate=eu",
    )
    assert key_of(DataParams("acme", {"k": -3}), "customer", "l") == "acme"
    assert key_of(DataParams("acme", {"k": -3}), "inner.k", "l") == "-3"


@pytest.mark.parametrize("value", [True, False, 1.5, 2.0, None, b"x", ["a"], {"a": 1}])
def test_key_wrong_type_refused(value: object) -> None:
    with pytest.raises(LimitKeyError, match="must be a str or an int"):
        key_of({"k": value}, "k", "lim")


@pytest.mark.parametrize(("params", "field"), [({}, "k"), ({"a": {}}, "a.b"),
    ({"a": "str"}, "a.upper"), ({"a": 5}, "a.real"), (Inner(region="x"), "nope"),
    (DataParams("c", {}), "inner.k"), (None, "k")])  # fmt: skip
def test_key_missing_field(params: object, field: str) -> None:
    with pytest.raises(LimitKeyError) as info:
        key_of(params, field, "my.limit")
    assert repr(field) in str(info.value) and "'my.limit'" in str(info.value)
    assert "missing" in str(info.value)


def test_refs_for_missing_field_names_limit_and_field() -> None:
    with pytest.raises(LimitKeyError, match=r"'t\.rate'.*'customer'"):
        refs_for(bind("t", [RateLimit(1, key="customer")]), {"other": 1})


def test_key_length() -> None:
    assert key_of({"k": "x" * MAX_KEY_BYTES}, "k", "l") == "x" * MAX_KEY_BYTES
    assert key_of({"k": "é" * (MAX_KEY_BYTES // 2)}, "k", "l")
    for value in ["", "x" * (MAX_KEY_BYTES + 1), "é" * (MAX_KEY_BYTES // 2 + 1), 10**200]:
        with pytest.raises(LimitKeyError, match="empty key or one over"):
            key_of({"k": value}, "k", "l")


# Found by this file: an int too long for str() (over 4300 digits) escaped as a plain ValueError.
def test_key_huge_int_is_a_limit_key_error() -> None:
    with pytest.raises(LimitKeyError):
        key_of({"k": 10**5000}, "k", "l")


# -- check_refs -------------------------------------------------------------------------------


def test_check_refs_accepts() -> None:
    assert check_refs(["a", "b=x"]) == ("a", "b=x")
    assert check_refs(("a=x=y", "b=" + "k" * MAX_KEY_BYTES)) == ("a=x=y", "b=" + "k" * 200)
    assert check_refs(()) == ()


@pytest.mark.parametrize("value", ["a", b"a", {"a"}, None, iter(["a"])])
def test_check_refs_refuses_non_sequences(value: object) -> None:
    with pytest.raises(TypeError):
        check_refs(value)


@pytest.mark.parametrize("refs", [["=x"], ["a="], ["a b"], [""], ["a=1", "a=2"], ["a", "a=1"],
    ["a=" + "k" * (MAX_KEY_BYTES + 1)], [f"l{i}" for i in range(MAX_LIMITS + 1)]])  # fmt: skip
def test_check_refs_refuses_malformed(refs: list[str]) -> None:
    with pytest.raises(ValueError):
        check_refs(refs)


def test_check_refs_refuses_non_str_ref() -> None:
    with pytest.raises(TypeError, match="int"):
        check_refs(["a", 1])


# -- to_json / from_json ----------------------------------------------------------------------


@pytest.mark.parametrize("limit", [Concurrency(3), Concurrency(5, per="a.b"), RateLimit(2.5),
    RateLimit(10, per=60, burst=4, key="customer")])  # fmt: skip
def test_json_round_trip(limit: Concurrency | RateLimit) -> None:
    text = to_json(limit)
    assert from_json(text) == limit
    assert to_json(from_json(text)) == text
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert " " not in text


def test_json_equal_definitions_equal_text() -> None:
    assert to_json(RateLimit(2, per=timedelta(minutes=1))) == to_json(RateLimit(2.0, per=60.0))
    assert to_json(RateLimit(2.5)) == to_json(RateLimit(2.5, burst=3))
    assert to_json(Concurrency(3, name="a")) == to_json(Concurrency(3, name="b"))
    assert to_json(Concurrency(3)) != to_json(Concurrency(4))
    assert bind("t", [Concurrency(3)])[0].to_json() == to_json(Concurrency(3))
    assert json.loads(to_json(Concurrency(3))) == {"kind": "concurrency", "max": 3, "per": None}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "null",
        "[]",
        "1",
        '"rate"',
        "{}",
        '{"kind":"token"}',
        '{"kind":"concurrency"}',
        '{"kind":"rate","rate":1,"per":1}',
        '{"kind":"concurrency","max":0}',
        '{"kind":"concurrency","max":true}',
        '{"kind":"rate","rate":NaN,"per":1,"burst":1}',
        '{"kind":"concurrency","max":1,"per":"a-b"}',
    ],
)
def test_from_json_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not a limit definition"):
        from_json(text)


# -- refill -----------------------------------------------------------------------------------


def test_refill_rate() -> None:
    limit = RateLimit(10, per=1, burst=5)
    assert refill(0.0, 0, 100_000, limit) == pytest.approx(1.0)
    assert refill(1.5, 1_000, 251_000, limit) == pytest.approx(4.0)
    assert refill(0.0, 0, 1_000_000, RateLimit(10, per=60, burst=5)) == pytest.approx(1 / 6)


def test_refill_caps_at_burst() -> None:
    limit = RateLimit(10, per=1, burst=5)
    assert refill(0.0, 0, 10_000_000, limit) == 5.0
    assert refill(4.9, 0, 100_000, limit) == 5.0


def test_refill_clock_back_never_lowers() -> None:
    limit = RateLimit(10, burst=5)
    assert refill(2.5, 1_000_000, 0, limit) == 2.5
    assert refill(2.5, 1_000_000, 1_000_000, limit) == 2.5


# -- LimitConflict ----------------------------------------------------------------------------


def test_limit_conflict_message() -> None:
    exc = LimitConflict("send.rate", '{"a":1}', '{"a":2}')
    assert isinstance(exc, ValueError)
    assert "'send.rate'" in str(exc) and "--replace-limits" in str(exc)
    assert (exc.limit_id, exc.recorded, exc.given) == ("send.rate", '{"a":1}', '{"a":2}')


def test_a_key_with_a_lone_surrogate_is_refused() -> None:
    with pytest.raises(LimitKeyError):
        key_of({"k": "a\ud800"}, "k", "l")
    with pytest.raises(ValueError):
        check_refs(["l=a\ud800"])
