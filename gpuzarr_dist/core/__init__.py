"""The device-free model: array metadata and selection plans."""
