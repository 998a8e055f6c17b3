"""`kvgate sim`: an in-process emulator of one vLLM replica (engine model, prefix cache, metrics)."""
