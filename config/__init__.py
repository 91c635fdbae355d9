"""Settings from the environment and the datasets file."""
