"""What every role in a pod shares: discovery, the request plane, the event plane, the system server."""
