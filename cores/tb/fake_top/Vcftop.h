// A scripted stand-in for a Verilated AXI top module (cf_axi_ports.vh): its
// ports are plain fields the test drives between clock cycles, and eval()
// does nothing, so tb_axi_rules.cpp can make the master break AXI rules on
// purpose and see whether the wrapper's memory model notices.
#ifndef CF_FAKE_VCFTOP_H
#define CF_FAKE_VCFTOP_H
#include <cstdint>
struct VerilatedContext;
struct Vcftop {
    Vcftop(VerilatedContext *, const char *) {}
    void eval() {}
    void final() {}
    uint8_t ap_clk = 0, ap_rst_n = 0;
    uint8_t s_axi_control_AWVALID = 0, s_axi_control_AWREADY = 0, s_axi_control_WVALID = 0,
            s_axi_control_WREADY = 0, s_axi_control_BVALID = 0, s_axi_control_BREADY = 0,
            s_axi_control_ARVALID = 0, s_axi_control_ARREADY = 0, s_axi_control_RVALID = 0,
            s_axi_control_RREADY = 0, s_axi_control_WSTRB = 0, s_axi_control_AWADDR = 0,
            s_axi_control_ARADDR = 0, s_axi_control_BRESP = 0, s_axi_control_RRESP = 0;
    uint32_t s_axi_control_WDATA = 0, s_axi_control_RDATA = 0;
    uint8_t m_axi_gmem_AWVALID = 0, m_axi_gmem_AWREADY = 0, m_axi_gmem_AWLEN = 0,
            m_axi_gmem_AWSIZE = 0, m_axi_gmem_AWBURST = 0, m_axi_gmem_WVALID = 0,
            m_axi_gmem_WREADY = 0, m_axi_gmem_WSTRB = 0, m_axi_gmem_WLAST = 0,
            m_axi_gmem_BVALID = 0, m_axi_gmem_BREADY = 0, m_axi_gmem_BRESP = 0,
            m_axi_gmem_ARVALID = 0, m_axi_gmem_ARREADY = 0, m_axi_gmem_ARLEN = 0,
            m_axi_gmem_ARSIZE = 0, m_axi_gmem_ARBURST = 0, m_axi_gmem_RVALID = 0,
            m_axi_gmem_RREADY = 0, m_axi_gmem_RLAST = 0, m_axi_gmem_RRESP = 0;
    uint64_t m_axi_gmem_AWADDR = 0, m_axi_gmem_WDATA = 0, m_axi_gmem_ARADDR = 0,
             m_axi_gmem_RDATA = 0;
    uint8_t __SYM__interrupt = 0;
};
#endif
