"""Locks: the wait queue every recipe shares (:mod:`.wait_queue`), what a holder has
(:mod:`.hold`), a hold per task (:mod:`.task_lock`), cohort mode (:mod:`.cohort`), and the
mutex, semaphore, read-write lock and fenced writes built on them."""
