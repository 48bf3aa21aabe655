"""Side-by-side benchmark of chongming-redis and its Python peers (``python -m bench.peers``)."""
