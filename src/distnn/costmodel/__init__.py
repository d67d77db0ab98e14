"""The cost model behind ``distnn plan``: what MPICH's collectives cost on a link
(``collectives``), the step of each rule and compression on N hosts from what the rules
declare they send (``predict``), and the exchange's own CPU measured on this machine
(``cpu``). docs/costmodel.md gives its equations and what it leaves out."""
