"""``distnn launch``: the supervisor that starts a job's ranks on its hosts and restarts
it from its checkpoint when a rank or host is lost (``supervisor``), its elastic form with
hosts that come and go (``elastic``) and the commit store its ranks report to
(``commits``), the watch on each rank's process (``rankwatch``) and process helpers
(``procs``)."""
