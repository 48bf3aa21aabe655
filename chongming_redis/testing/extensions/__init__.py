"""The sections of ``ExtensionsContract`` (``testing/extensions_contract.py``): the reads beyond
the ``TaskStore`` protocol (batched commits and starts, dashboard reads, paged queries,
producer reads) and the task policies' duties (unique ids, deadlines, retention).
``StoreContract``'s own sections are in ``testing/contract/``."""
