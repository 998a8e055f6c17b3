"""OpenAI Responses: the adapter (stored responses, continuations) and its mid-stream migration."""
