"""The serving worker's OpenAI-compatible HTTP endpoint: the FastAPI app run by uvicorn (app.py),
request validation and response shapes (protocol.py), Prometheus gauges (metrics.py), what an
endpoint holds and admits (state.py: executors/policies/endpoint_admission.py's SLO admission),
uvicorn's thread (server.py). It talks
to the co-serving executor only through its public API; may import executors.coserving, never
vLLM directly, workers, scheduling, tasks or flows.
"""
