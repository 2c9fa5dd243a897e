"""Rank-aware multiprocess loaders over imgprep shards and label lists.

Every rank yields exactly the same number of batches per epoch (stated from the manifest
before the epoch starts); epoch order is a pure function of (seed, epoch, World) and can be
resumed at any batch; batches leave as uint8 NCHW and are normalised on the device.
"""
