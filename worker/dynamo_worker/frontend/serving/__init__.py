"""Serving a request: waiting for a slot of its model (admission), choosing and talking to workers
(dispatch, with migration and quarantine), and relaying their stream to the client (the runs)."""
