"""A distnn model in a file: train it with

    mpiexec -n 2 distnn train --model examples/mnist_distnn.py --num_epochs 3

distnn imports this file and calls build_model(), giving it the arguments it names
(input_shape, num_classes, dtype, seed). An unbuilt Sequential is built for the dataset.
"""
from distnn.nn import Conv2D, Dense, Flatten, MaxPool2D, ReLU, Sequential


def build_model(num_classes: int = 10) -> Sequential:
    return Sequential([Conv2D(8, 3, padding=1), ReLU(), MaxPool2D(2),
                       Conv2D(16, 3, padding=1), ReLU(), MaxPool2D(2),
                       Flatten(), Dense(128), ReLU(), Dense(num_classes)],
                      name="mnist_distnn")
