"""The row limit of row-by-row attention, one constant for the model and the kernels.

Fused attention over n query rows rounds differently from n one-row calls, and the casts in front
of packed integer kernels can amplify that into a flipped greedy token. So each sequence's cached
pass of up to ROW_BY_ROW_MAX rows (gamma 64, the longest, plus the root; trees of up to 64 nodes)
attends row by row, each row over exactly the keys of its own path, as a one-token step does
(`model.llama.attend`, `decoder.Stack`), and f32dot takes float32 linear layers of up to that many
rows, so a verify row and the step at its position run the same kernels and agree bit for bit
wherever every matmul is row-invariant. A prefill (an empty cache) and longer passes take fused
attention and torch's GEMM, which are faster there.
"""

ROW_BY_ROW_MAX = 65
