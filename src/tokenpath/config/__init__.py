"""The ground floor: the assumptions registry, units, files, errors and the machine's memory; it imports
nothing of tokenpath's above it."""
