"""The job queue: the queue (:mod:`.queue`), jobs as stored (:mod:`.records`), putting
(:mod:`.put`), claiming (:mod:`.claim`) and how a claim ends (:mod:`.endings`)."""
