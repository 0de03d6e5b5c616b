"""pytest plugin (entry point ``pytest11``): kill-test fixtures for users' own plans.

Loaded by pytest in every environment where ninelives is installed, so it
must stay cheap to import and register nothing that a test did not ask for.
"""

from __future__ import annotations
