"""Test helpers that ship with the package (the ``StoreContract`` suite)."""
