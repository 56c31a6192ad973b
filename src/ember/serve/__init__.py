"""`ember serve`: an OpenAI-compatible HTTP server over ember's LLMs and sentence embedders.

`ember.serve.app.create_app` builds the ASGI app (starlette; the `serve` extra), whose requests
go to `ember.serve.engine.Engine`: a scheduler and the model loop on one worker thread. Nothing
here is imported by `import ember`.
"""
