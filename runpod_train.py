#!/usr/bin/env python
"""Train the OpenKBP dose-prediction U-Net: python runpod_train.py --filters 64 --epochs 100 (see --help)."""

from provided_code.apps.cli import main

if __name__ == "__main__":
    main()
