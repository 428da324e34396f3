#!/usr/bin/env python3
"""Write a same-vocabulary draft by keeping the first N blocks of a GGUF model.

    python scripts/make_truncated_draft.py ../shared/models/stories260K.gguf /tmp/draft.gguf --layers 2
"""

import argparse

from llamaspec.gguf_tools import truncate_layers

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("source")
parser.add_argument("destination")
parser.add_argument("--layers", type=int, required=True, help="blocks to keep")
args = parser.parse_args()
print(truncate_layers(args.source, args.destination, args.layers))
