"""Images in, labels or embeddings out: preprocessing, ImageClassifier, ImageEmbedder, and frame sources.

    from sdk import ImageClassifier
    with ImageClassifier("google/vit-base-patch16-224") as clf:
        print(clf.classify("cat.jpg"))                        # [Prediction(label, score, index), ...]
    with ImageClassifier("openai/clip-vit-base-patch32", labels=["cat", "dog"]) as clf:  # zero-shot
        ...

One job per file: resize.py (PIL-exact resizing), preprocess.py (a checkpoint's preprocessor_config.json),
image_file.py and image_size.py (reading image files, their size checked from the header first), programs.py
(options and the graphs a model folder runs), model.py, classifier.py and embedder.py (the pipelines), and the
frame sources: files.py (images, videos), camera.py (cameras and live streams: a grabber thread keeps only the
newest frame, so results never lag reality) and sources.py (a SOURCE argument -> one of those).
"""
from .camera import Camera, list_cameras
from .classifier import ImageClassifier, Prediction
from .embedder import ImageEmbedder
from .files import Frame, ImageFiles, VideoFile
from .image_file import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, read_image
from .preprocess import MAX_ASPECT, Preprocessor, center_crop
from .programs import (DEFAULT_CLASSIFIER, DEFAULT_EMBEDDER, FRAME_OPTIONS, VisionOptions, batch_sizes, image_graphs,
                       is_zero_shot, program_graphs)
from .resize import resize
from .sources import IMAGE_SUFFIXES, STREAM_TIMEOUT_MS, VIDEO_SUFFIXES, check_source, is_camera, open_source

__all__ = ["Camera", "list_cameras", "ImageClassifier", "Prediction", "ImageEmbedder", "Frame", "ImageFiles",
           "VideoFile", "MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "read_image", "MAX_ASPECT", "Preprocessor",
           "center_crop", "DEFAULT_CLASSIFIER", "DEFAULT_EMBEDDER", "FRAME_OPTIONS", "VisionOptions", "batch_sizes",
           "image_graphs", "is_zero_shot", "program_graphs", "resize", "IMAGE_SUFFIXES", "STREAM_TIMEOUT_MS",
           "VIDEO_SUFFIXES", "check_source", "is_camera", "open_source"]
