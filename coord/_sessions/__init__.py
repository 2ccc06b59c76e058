"""Sessions: one lease with the store and the tasks it owns (:mod:`.session`), the work
those tasks do for callers that may go away (:mod:`.work`), the chain of sessions of a
client (:mod:`.keeper`), the source of a client that opens none (:mod:`.readonly`), the
waits that need no session (:mod:`.readers`), and who a client is (:mod:`.identity`)."""
