"""A Theano-MPI model class (written against ``theano.tensor`` as Theano-MPI's examples
are: conv2d + pool_2d + dense + softmax, momentum SGD through ``theano.function``
updates) trained by distnn, with PyTensor serving ``import theano``.

Run it as Theano-MPI's Python form (``examples/theanompi_bsp.py``: it starts
``mpiexec -n 2`` itself), or from a session file (``RULE=BSP``, ``MODELFILE=examples/
theanompi_fashion_cnn.py``, ``MODELCLASS=FashionCNN``: ``distnn train --config FILE``).
"""
import gzip
import os

import numpy as np
import theano
import theano.tensor as T
from theano.tensor.nnet import conv2d, relu, softmax
from theano.tensor.signal.pool import pool_2d

FOLDER = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def _idx(name, offset):
    with gzip.open(os.path.join(FOLDER, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


class FashionData:
    """Fashion-MNIST for one worker: global batch i of ``size * batch_size`` samples, this
    worker's part being the ``rank``-th slice (Theano-MPI's data classes shard by rank)."""

    def __init__(self, rank, size, batch_size, n_train=None, n_val=None, seed=0,
                 dtype="float32"):
        x = _idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
        y = _idx("train-labels-idx1-ubyte.gz", 8).astype(np.int32)
        xv = _idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
        yv = _idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int32)
        scale = np.asarray(1 / 255.0, dtype)
        self.x, self.y = x[:n_train].astype(dtype) * scale, y[:n_train]
        self.xv, self.yv = xv[:n_val].astype(dtype) * scale, yv[:n_val]
        self.rank, self.size, self.batch_size, self.seed = rank, size, batch_size, seed
        self.n_batch_train = len(self.y) // (size * batch_size)
        self.n_batch_val = len(self.yv) // (size * batch_size)
        self.order = np.arange(len(self.y))

    def shuffle_data(self, epoch):
        # the same permutation on every worker: the global batches are cut the same way
        self.order = np.random.RandomState(self.seed + epoch).permutation(len(self.y))

    def _part(self, i):
        start = (i * self.size + self.rank) * self.batch_size
        return slice(start, start + self.batch_size)

    def train_batch(self, i):
        idx = self.order[self._part(i)]
        return self.x[idx], self.y[idx]

    def val_batch(self, i):
        part = self._part(i)
        return self.xv[part], self.yv[part]


class FashionCNN:
    """conv 5x5 (16) -> max pool 2 -> conv 5x5 (32) -> max pool 2 -> dense 128 -> softmax.

    config: Theano-MPI's (verbose, rank, size) and, optionally, batch_size (per worker),
    learning_rate, momentum, lr_decay (per epoch), n_epochs, n_train, n_val, seed, floatX,
    weights_file (the trained weights are saved there at cleanup).
    """

    def __init__(self, config):
        self.verbose = config["verbose"]
        self.rank, self.size = config["rank"], config["size"]
        floatX = config.get("floatX", theano.config.floatX)
        self.batch_size = int(config.get("batch_size", 32))
        self.n_epochs = int(config.get("n_epochs", 3))
        self.lr_decay = float(config.get("lr_decay", 0.7))
        self.weights_file = config.get("weights_file")
        self.writes = config.get("worker_type", "worker") == "worker" and self.rank == 0
        self.epoch, self.n_subb = 0, 1
        self.current_t = self.current_v = 0
        self.data = FashionData(self.rank, self.size, self.batch_size,
                                config.get("n_train"), config.get("n_val"),
                                int(config.get("seed", 0)), floatX)
        rng = np.random.RandomState(int(config.get("seed", 0)) + 23455)

        def weight(shape, fan_in):
            w = rng.normal(0, np.sqrt(2.0 / fan_in), shape).astype(floatX)
            return theano.shared(w)

        def bias(n):
            return theano.shared(np.zeros(n, floatX))

        self.W1, self.b1 = weight((16, 1, 5, 5), 25), bias(16)
        self.W2, self.b2 = weight((32, 16, 5, 5), 400), bias(32)
        self.W3, self.b3 = weight((512, 128), 512), bias(128)
        self.W4, self.b4 = weight((128, 10), 128), bias(10)
        self.params = [self.W1, self.b1, self.W2, self.b2, self.W3, self.b3, self.W4, self.b4]
        self.vels = [theano.shared(p.get_value() * 0) for p in self.params]
        self.shared_lr = theano.shared(np.asarray(config.get("learning_rate", 0.05), floatX))
        self.mu = np.asarray(config.get("momentum", 0.9), floatX)
        self.shared_x = theano.shared(np.zeros((self.batch_size, 1, 28, 28), floatX))
        self.shared_y = theano.shared(np.zeros(self.batch_size, np.int32))
        self.build_model()

    def build_model(self):
        self.x, self.y = T.tensor4("x"), T.ivector("y")
        h = relu(conv2d(self.x, self.W1) + self.b1.dimshuffle("x", 0, "x", "x"))
        h = pool_2d(h, ws=(2, 2), ignore_border=True)
        h = relu(conv2d(h, self.W2) + self.b2.dimshuffle("x", 0, "x", "x"))
        h = pool_2d(h, ws=(2, 2), ignore_border=True).flatten(2)
        h = relu(T.dot(h, self.W3) + self.b3)
        self.p_y = softmax(T.dot(h, self.W4) + self.b4)
        self.cost = T.mean(T.nnet.categorical_crossentropy(self.p_y, self.y))
        self.error = T.mean(T.neq(T.argmax(self.p_y, axis=1), self.y))
        top5 = T.argsort(self.p_y, axis=1)[:, -5:]
        self.error_top5 = 1 - T.mean(T.any(T.eq(top5, self.y.dimshuffle(0, "x")), axis=1))
        self.grads = T.grad(self.cost, self.params)

    def compile_iter_fns(self, sync_type="avg"):
        updates = []
        for p, v, g in zip(self.params, self.vels, self.grads):
            step = self.mu * v - self.shared_lr * g
            updates += [(v, step), (p, p + step)]
        givens = {self.x: self.shared_x, self.y: self.shared_y}
        self.train_iter_fn = theano.function([], [self.cost, self.error], updates=updates,
                                             givens=givens)
        self.val_iter_fn = theano.function([], [self.cost, self.error, self.error_top5],
                                           givens=givens)

    def train_iter(self, count, recorder):
        if self.current_t == 0:
            self.data.shuffle_data(self.epoch)
        x, y = self.data.train_batch(self.current_t)
        self.shared_x.set_value(x)
        self.shared_y.set_value(y)
        recorder.start()
        cost, error = self.train_iter_fn()
        recorder.end("calc")
        recorder.train_error(count, cost, error)
        self.current_t = (self.current_t + 1) % self.data.n_batch_train

    def val_iter(self, count, recorder):
        x, y = self.data.val_batch(self.current_v)
        self.shared_x.set_value(x)
        self.shared_y.set_value(y)
        cost, error, error_top5 = self.val_iter_fn()
        recorder.val_error(count, cost, error, error_top5)
        self.current_v = (self.current_v + 1) % max(self.data.n_batch_val, 1)

    def reset_iter(self, mode):
        if mode == "train":
            self.current_t = 0
        else:
            self.current_v = 0

    def adjust_hyperp(self, epoch):
        lr = self.shared_lr.get_value() * self.lr_decay
        self.shared_lr.set_value(np.asarray(lr, self.shared_lr.dtype))

    def cleanup(self):
        if self.weights_file and self.writes:
            np.savez(self.weights_file, *[p.get_value() for p in self.params])

