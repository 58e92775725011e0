/*
 * qdebug's harness around Deeploy's generated network: feeds samples through the generated input buffers and
 * writes the generated output buffers, byte for byte as the generated code lays them out.
 *
 *   harness INPUTS.bin OUTPUTS.bin N
 *
 * INPUTS.bin holds N samples, each the concatenation of every input buffer (DeeployNetwork_inputs_bytes[i]
 * bytes each, in input order); OUTPUTS.bin receives N samples of every output buffer likewise.
 * Exit codes: 0 done, 2 usage, 3 I/O (a short input file included).
 *
 * Part of qdebug (Apache-2.0).
 */
#include "Network.h"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s INPUTS.bin OUTPUTS.bin N\n", argv[0]);
    return 2;
  }
  long n = strtol(argv[3], NULL, 10);
  FILE *in = fopen(argv[1], "rb");
  FILE *out = fopen(argv[2], "wb");
  if (in == NULL || out == NULL || n < 0) {
    fprintf(stderr, "cannot open %s or %s\n", argv[1], argv[2]);
    return 3;
  }
  InitNetwork(0, 1);
  for (long s = 0; s < n; ++s) {
    for (uint32_t i = 0; i < DeeployNetwork_num_inputs; ++i) {
      if (fread(DeeployNetwork_inputs[i], 1, DeeployNetwork_inputs_bytes[i], in) != DeeployNetwork_inputs_bytes[i]) {
        fprintf(stderr, "sample %ld: input %u is short\n", s, (unsigned)i);
        return 3;
      }
    }
    RunNetwork(0, 1);
    for (uint32_t o = 0; o < DeeployNetwork_num_outputs; ++o) {
      if (fwrite(DeeployNetwork_outputs[o], 1, DeeployNetwork_outputs_bytes[o], out) != DeeployNetwork_outputs_bytes[o]) {
        fprintf(stderr, "sample %ld: cannot write output %u\n", s, (unsigned)o);
        return 3;
      }
    }
  }
  if (fclose(out) != 0) {
    return 3;
  }
  fclose(in);
  return 0;
}
