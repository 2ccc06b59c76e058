"""Group membership and partition ownership: the group (:mod:`.group`), the partitioner
(:mod:`.partitioner`), one member's life in it (:mod:`.member`), its share
(:mod:`.owner`), one partition (:mod:`.partition`) and the assignment
(:mod:`.assignment`)."""
