"""What every layer of the package stands on, and knows nothing of dose prediction: writing files
whole (``atomic``), TensorFlow's process settings made before it loads (``environment``), the
progress hook (``progress``), the operating system's lock on a folder (``run_lock``), and the
check that a folder can be written, made before TensorFlow loads (``preflight``)."""
