"""OpenAI chat completions: the adapter and its mid-stream migration."""
