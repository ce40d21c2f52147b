"""The OpenAI-compatible server (`memra serve`): api (routes, validation, SSE), scheduler (the
engine thread: continuous batching under a token budget), prefix_cache, metrics, auth,
cpu_engine (the runner's interface over the CPU reference), bench (`memra bench serve`)."""
