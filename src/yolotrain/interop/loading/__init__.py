"""Loading models from files: which model a ``--weights``/``--model`` argument names (:mod:`.resolve`), our
checkpoints and official YOLOv5 ones (:mod:`.pretrained`, :mod:`.official`, :mod:`.classify`) and Ultralytics ones
(:mod:`.ultralytics`) read without running pickled code (:mod:`.unpickler`), and downloads of released weights
(:mod:`.hub`)."""
