"""The only active part: the controller's step (generate, verify, batch, train, publish), the async
loop, worker futures and evaluation (docs/staleness.md)."""
