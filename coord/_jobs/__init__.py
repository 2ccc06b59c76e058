"""The job queue: the queue (:mod:`.queue`), jobs as stored (:mod:`.records`), putting
(:mod:`.put`), claiming (:mod:`.claim`), how a claim ends (:mod:`.endings`) and the worker loop
(:mod:`.worker`)."""
