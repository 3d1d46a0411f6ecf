// Stand-in for Verilator's runtime header, for tb_axi_rules.cpp: the AXI
// wrapper compiled against a scripted top module instead of a Verilated one.
#ifndef CF_FAKE_VERILATED_H
#define CF_FAKE_VERILATED_H
struct VerilatedContext {};
#endif
