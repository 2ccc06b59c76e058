"""Leader election: campaign, proclaim, resign (:mod:`.election`); who leads, and
observing it (:mod:`.leader`)."""
