"""The suite leaves the user's folders as it found them (conftest.py runs this file last).

The user's ppd data, cache, config and state folders and the Hugging Face home were listed (names, sizes, mtimes)
before conftest.py pointed XDG_*_HOME and HF_HOME at the run's own folders; after a full run nothing there was added,
removed or changed, and no new entry appeared directly in the user's data, cache, config or state folder.
"""

from __future__ import annotations

import user_folders


def test_the_run_left_the_users_folders_unchanged():
    changed = user_folders.changes()
    assert not changed, f"{len(changed)} paths changed in the user's folders: " + "; ".join(changed[:10])
