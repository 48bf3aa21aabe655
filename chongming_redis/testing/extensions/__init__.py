"""The sections of ``ExtensionsContract`` (``testing/extensions_contract.py``): the reads beyond
the ``TaskStore`` protocol (batched commits and starts, dashboard reads, paged queries,
producer reads). ``StoreContract``'s own sections are in ``testing/contract/``."""
