"""A stand-in for a dependency's new release that warns as it is imported (tests/test_stderr_contract.py):
each of the console's libraries raises a UserWarning (shown by default, as cryptography's
deprecation warnings are) the first time it is imported."""

import sys
import warnings

NOISY = {"asyncssh", "httpx", "apprise", "textual", "rich", "psutil", "gguf", "prometheus_client"}


class WarnOnImport:
    def find_spec(self, name, path=None, target=None):
        if name in NOISY:
            NOISY.discard(name)
            warnings.warn(f"{name} 99.0 deprecates this", UserWarning, stacklevel=2)
        return None  # the real import goes on


sys.meta_path.insert(0, WarnOnImport())
