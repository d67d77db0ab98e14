"""Theano-MPI's Python form, run by distnn: BSP over two ranks (it starts ``mpiexec -n 2``
as Theano-MPI starts ``mpirun``; the device names only count the workers, on CPU).

    python examples/theanompi_bsp.py
"""
import os

from distnn.run.theanompi import BSP

rule = BSP()
rule.init(devices=["cuda0", "cuda1"],
          modelfile=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "theanompi_fashion_cnn.py"),
          modelclass="FashionCNN")
rule.wait()
