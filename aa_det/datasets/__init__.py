from .synthetic_shapes import CLASSES, generate_shapes_coco

__all__ = ["CLASSES", "generate_shapes_coco"]
