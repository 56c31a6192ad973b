"""`import ember` and the `ember` command's parser leave the server stack unimported."""

import subprocess
import sys


def test_serve_stack_is_imported_only_by_the_serve_command():
    code = (
        "import sys, ember, ember.cli.main\n"
        "ember.cli.main.build_parser()\n"
        "print(','.join(m for m in ('starlette', 'uvicorn', 'ember.serve', 'httpx', 'openai') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
