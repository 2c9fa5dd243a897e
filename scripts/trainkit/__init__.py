"""Small modules of the embedded trainer (scripts/train_imagenet.py)."""
