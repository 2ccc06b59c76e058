"""The leaves: exceptions, argument checks, the key layout, URLs, retry, statistics,
deferred calls and background tasks. Data types and helpers that every layer above uses;
nothing here imports a higher layer."""
