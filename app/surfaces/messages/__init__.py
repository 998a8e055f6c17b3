"""Anthropic Messages: the adapter (and count_tokens), its wire words, its migration and the chat request a cut
Messages stream continues as."""
