"""The README's Python example runs as written."""
import contextlib
import io
import re

import numpy as np

from conftest import REPO


def test_readme_python_example():
    text = (REPO / "README.md").read_text()
    m = re.search(r"<!-- test: README Python example[^\n]*\n```python\n(.*?)\n```", text, re.S)
    assert m, "README.md has no marked Python example"
    buf = io.StringIO()
    env = {}
    with contextlib.redirect_stdout(buf):
        exec(compile(m.group(1), "README.md", "exec"), env)
    assert np.isfinite(env["out"].astype(np.float32)).all()
    assert buf.getvalue().strip() == "(2, 8, 128) 2.25 bits per element in the 2-bit region", buf.getvalue()
