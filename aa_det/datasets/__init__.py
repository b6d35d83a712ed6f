from .synthetic_shapes import CLASSES, generate_shapes_coco, generate_shapes_folder, generate_shapes_split

__all__ = ["CLASSES", "generate_shapes_coco", "generate_shapes_folder", "generate_shapes_split"]
