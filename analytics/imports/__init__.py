"""What ``analyze import`` reads: TensorBoard event files (tbimport, tbplan), CM-DARE's
overhead records and spot lifetimes (overheads, lives) and PyTorch profiler traces (traces),
each into the store through the ingest layer's writer."""
