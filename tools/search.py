"""``python tools/search.py ARGS`` runs ``python -m alfish.tools.search ARGS``
with this checkout's alfish; its usage is in alfish/tools/search.py."""
import pathlib
import sys

# This checkout's alfish, not another one installed in the environment; and not tools/ itself, whose scripts would
# shadow modules of the same names.
sys.path[0] = str(pathlib.Path(__file__).resolve().parents[1])

from alfish.tools.search import main  # noqa: E402  (after the path is set)

if __name__ == "__main__":
    sys.exit(main())
