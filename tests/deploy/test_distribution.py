"""The installed distribution: the top-level import names it ships are its own."""

from __future__ import annotations

from importlib.metadata import packages_distributions

import pytest

# PyPI has distributions with the first four names; one installed beside scrapesync would
# overwrite or shadow its package of the same name.
TOP_LEVEL_NAMES = ("sync", "webhooks", "config", "simulator", "scrapesync")


@pytest.mark.parametrize("name", TOP_LEVEL_NAMES)
def test_each_top_level_import_name_belongs_to_scrapesync_and_no_other_distribution(
    name: str,
) -> None:
    """The import name maps to the scrapesync distribution, and no other installed distribution
    provides a module or package of that name."""
    owners = set(packages_distributions().get(name, []))
    assert "scrapesync" in owners, f"{name!r} is not provided by scrapesync: {sorted(owners)}"
    assert owners == {"scrapesync"}, (
        f"{name!r} is also provided by {sorted(owners - {'scrapesync'})}"
    )
