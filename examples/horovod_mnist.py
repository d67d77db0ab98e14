"""Horovod's PyTorch MNIST recipe on distnn.torch: the same calls, with
`import distnn.torch as hvd` in place of `import horovod.torch as hvd`, Fashion-MNIST from
distnn's dataset readers in place of torchvision, and the CPU only.

    mpiexec -n 2 python examples/horovod_mnist.py --epochs 3
    mpiexec -n 2 python examples/horovod_mnist.py --use-adasum      # lr not scaled by size
    mpiexec -n 2 python examples/horovod_mnist.py --fp16-allreduce --gradient-predivide-factor 2

Each rank reads its shard through torch's DistributedSampler; gradients are averaged (or
combined by Adasum) by hvd.DistributedOptimizer; the test metrics are averaged over ranks
with hvd.allreduce(..., name=...), as in Horovod's example.
"""
import argparse

import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from torch import nn, optim

import distnn.torch as hvd
from distnn.data import load_dataset

parser = argparse.ArgumentParser(description="Horovod's MNIST recipe on distnn.torch")
parser.add_argument("--batch-size", type=int, default=64, help="per rank")
parser.add_argument("--test-batch-size", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=100)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--clip", type=float, default=0.0,
                    help="clip the gradient norm (the synchronize/skip_synchronize pattern)")
parser.add_argument("--steps", type=int, default=0, help="at most this many steps per epoch")


class Net(nn.Module):
    """Horovod's example network (two convolutions, dropout, two dense layers)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # Horovod: limit the CPU threads of each rank

    splits = load_dataset("fashion_mnist", validation_split=0.0)
    (x_train, y_train), (x_test, y_test) = splits.train.arrays(), splits.test.arrays()
    train_dataset = torch.utils.data.TensorDataset(torch.from_numpy(x_train),
                                                   torch.from_numpy(y_train).long())
    test_dataset = torch.utils.data.TensorDataset(torch.from_numpy(x_test),
                                                  torch.from_numpy(y_test).long())
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    # By default, Adasum doesn't need scaling up the learning rate.
    lr_scaler = hvd.size() if not args.use_adasum else 1
    if args.use_adasum and hvd.nccl_built():  # False here: no GPU build
        lr_scaler = hvd.local_size()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    def metric_average(val, name):
        return hvd.allreduce(torch.tensor(val), name=name).item()

    def train_epoch(epoch):
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            if args.steps and batch_idx >= args.steps:
                break
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            if args.clip and not args.use_adasum:
                optimizer.synchronize()  # the averaged gradients, then clip them
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                with optimizer.skip_synchronize():
                    optimizer.step()
            else:
                optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                      f"\tLoss: {loss.item():.6f}", flush=True)

    def test():
        model.eval()
        test_loss = test_accuracy = 0.0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(1)
                test_accuracy += float((pred == target).sum())
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")
        if hvd.rank() == 0:
            print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: "
                  f"{100.0 * test_accuracy:.2f}%", flush=True)

    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        test()


if __name__ == "__main__":
    main(parser.parse_args())
