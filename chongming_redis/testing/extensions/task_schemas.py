"""The contract of ``TaskSchemasStore`` (``stores/task_schema_store.py``): the parameter
schemas workers publish, read back exactly as written, the last write of a name winning
whatever its moment, a refused call writing nothing. Mixed into ``ExtensionsContract``; each
test returns at once when the store does not implement the extension."""

from __future__ import annotations

from chongming_redis.errors import StoreClosed
from chongming_redis.stores.task_schema_store import (
    MAX_SCHEMA_BYTES,
    PublishedSchema,
    TaskSchemasStore,
)
from chongming_redis.testing.contract.support import NAIVE, ContractBase, at, raises

#: A pydantic-like schema, spaced and non-ASCII as a hand-written one may be: kept as given.
RESIZE = (
    '{"properties": {"width": {"type": "integer", "title": "Größe ☃"}},'
    '  "required": ["width"], "type": "object"}'
)
ANY = "{}"
#: Names a backend could mistake for key syntax, patterns or markup.
AWKWARD_NAMES = ("a:b", "{x}", "*", "%", "é")


class TaskSchemasContract(ContractBase):
    def published_schemas(self) -> TaskSchemasStore | None:
        return self.store if isinstance(self.store, TaskSchemasStore) else None

    def test_published_schemas_are_read_back_exactly_as_written(self) -> None:
        if (store := self.published_schemas()) is None:
            return
        assert store.task_schemas() == {}  # nobody published any
        when = at(1.000001)  # a microsecond is kept
        store.record_task_schemas({"resize": RESIZE, "echo": ANY}, now=when)
        store.record_task_schemas({n: f'{{"title": "{i}"}}' for i, n in enumerate(AWKWARD_NAMES)},
                                  now=at(2))  # fmt: skip
        every = store.task_schemas()
        assert every["resize"] == PublishedSchema(RESIZE, when)
        assert every["echo"] == PublishedSchema(ANY, when)
        assert {n: every[n].schema for n in AWKWARD_NAMES} == {
            n: f'{{"title": "{i}"}}' for i, n in enumerate(AWKWARD_NAMES)
        }
        assert set(every) == {"resize", "echo", *AWKWARD_NAMES}
        assert store.task_schemas(["resize"]) == {"resize": PublishedSchema(RESIZE, when)}
        assert store.task_schemas(("echo", "nope")) == {"echo": PublishedSchema(ANY, when)}
        assert store.task_schemas(["{x}"]) == {"{x}": every["{x}"]}  # exact names
        assert store.task_schemas(["*", "%"]) == {"*": every["*"], "%": every["%"]}
        assert store.task_schemas(["nope"]) == {} and store.task_schemas([]) == {}
        assert store.task_schemas() == every  # a read twice

    def test_the_last_write_of_a_name_wins_and_the_other_names_stay(self) -> None:
        if (store := self.published_schemas()) is None:
            return
        store.record_task_schemas({"resize": ANY, "mail": ANY}, now=at(10))
        # A later write with an earlier moment (a worker whose clock lags) still wins.
        store.record_task_schemas({"resize": RESIZE}, now=at(5))
        store.record_task_schemas({}, now=at(20))  # nothing: writes nothing
        assert store.task_schemas() == {
            "resize": PublishedSchema(RESIZE, at(5)),
            "mail": PublishedSchema(ANY, at(10)),
        }
        store.record_task_schemas({"resize": ANY}, now=at(30))
        assert store.task_schemas(["resize"]) == {"resize": PublishedSchema(ANY, at(30))}

    def test_bad_schemas_are_refused_whole_and_a_closed_store_refuses_all(self) -> None:
        if (store := self.published_schemas()) is None:
            return
        record = store.record_task_schemas
        raises(ValueError, record, {"good": ANY, "bad": "[1, 2]"}, now=at(1))  # not an object
        raises(ValueError, record, {"good": ANY, "bad": "{"}, now=at(1))  # not JSON
        raises(ValueError, record, {"good": ANY, "bad": '"\ud800"'}, now=at(1))  # not UTF-8
        raises(TypeError, record, {"good": ANY, "bad": {"type": "object"}}, now=at(1))
        raises(ValueError, record, {"good": ANY, "": ANY}, now=at(1))
        raises(TypeError, record, {"good": ANY, 7: ANY}, now=at(1))
        raises(TypeError, record, '{"good": {}}', now=at(1))
        raises(ValueError, record, {"good": ANY}, now=NAIVE)
        raises(TypeError, record, {"good": ANY}, now="2024-03-10")
        long = '{"description": "' + "x" * MAX_SCHEMA_BYTES + '"}'
        raises(ValueError, record, {"good": ANY, "long": long}, now=at(1))
        raises(TypeError, store.task_schemas, "good")  # a str is not a collection of names
        raises(ValueError, store.task_schemas, ["good", ""])
        assert store.task_schemas() == {}  # nothing of a refused call
        self.close_store()
        raises(StoreClosed, record, {"good": ANY}, now=at(1))
        raises(StoreClosed, record, {}, now=at(1))
        raises(StoreClosed, store.task_schemas)
        raises(StoreClosed, store.task_schemas, [])
