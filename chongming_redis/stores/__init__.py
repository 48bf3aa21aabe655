"""Task stores: the protocol, the codec, and the built-in backends."""
