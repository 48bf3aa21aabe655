"""The sections of ``ExtensionsContract`` (``testing/extensions_contract.py``): the reads beyond
the ``TaskStore`` protocol that the dashboard and the producer use (dashboard reads, paged
queries, producer reads). ``StoreContract``'s own sections are in ``testing/contract/``."""
