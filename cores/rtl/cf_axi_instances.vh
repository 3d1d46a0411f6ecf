// Instantiates the control slave (`ctrl`, NWORDS argument words on `args`)
// and the master (`dma`) of an AXI core and wires them to the ports of
// cf_axi_ports.vh. The core declares NWORDS and drives ap_ready, ap_done,
// ap_idle, the dma_* command and the local-memory read data lm_rdata.
    wire [32*NWORDS-1:0] args;
    wire ap_start, dma_ready, dma_done, lm_we;
    wire [31:0] lm_waddr, lm_raddr;
    wire [63:0] lm_wdata;
    cf_axil_ctrl #(.NWORDS(NWORDS)) ctrl (
        .clock(ap_clk), .resetn(ap_rst_n),
        .AWVALID(s_axi_control_AWVALID), .AWREADY(s_axi_control_AWREADY), .AWADDR(s_axi_control_AWADDR),
        .WVALID(s_axi_control_WVALID), .WREADY(s_axi_control_WREADY), .WDATA(s_axi_control_WDATA),
        .WSTRB(s_axi_control_WSTRB), .BVALID(s_axi_control_BVALID), .BREADY(s_axi_control_BREADY),
        .BRESP(s_axi_control_BRESP), .ARVALID(s_axi_control_ARVALID), .ARREADY(s_axi_control_ARREADY),
        .ARADDR(s_axi_control_ARADDR), .RVALID(s_axi_control_RVALID), .RREADY(s_axi_control_RREADY),
        .RDATA(s_axi_control_RDATA), .RRESP(s_axi_control_RRESP), .interrupt(interrupt),
        .ap_start(ap_start), .ap_ready(ap_ready), .ap_done(ap_done), .ap_idle(ap_idle), .args(args)
    );
    cf_axi_dma dma (
        .clock(ap_clk), .resetn(ap_rst_n),
        .cmd_valid(dma_valid), .cmd_write(dma_write), .cmd_addr(dma_addr), .cmd_words(dma_words),
        .cmd_ready(dma_ready), .cmd_done(dma_done),
        .lm_we(lm_we), .lm_waddr(lm_waddr), .lm_wdata(lm_wdata), .lm_raddr(lm_raddr), .lm_rdata(lm_rdata),
        .AWVALID(m_axi_gmem_AWVALID), .AWREADY(m_axi_gmem_AWREADY), .AWADDR(m_axi_gmem_AWADDR),
        .AWLEN(m_axi_gmem_AWLEN), .AWSIZE(m_axi_gmem_AWSIZE), .AWBURST(m_axi_gmem_AWBURST),
        .WVALID(m_axi_gmem_WVALID), .WREADY(m_axi_gmem_WREADY), .WDATA(m_axi_gmem_WDATA),
        .WSTRB(m_axi_gmem_WSTRB), .WLAST(m_axi_gmem_WLAST), .BVALID(m_axi_gmem_BVALID),
        .BREADY(m_axi_gmem_BREADY), .BRESP(m_axi_gmem_BRESP), .ARVALID(m_axi_gmem_ARVALID),
        .ARREADY(m_axi_gmem_ARREADY), .ARADDR(m_axi_gmem_ARADDR), .ARLEN(m_axi_gmem_ARLEN),
        .ARSIZE(m_axi_gmem_ARSIZE), .ARBURST(m_axi_gmem_ARBURST), .RVALID(m_axi_gmem_RVALID),
        .RREADY(m_axi_gmem_RREADY), .RDATA(m_axi_gmem_RDATA), .RLAST(m_axi_gmem_RLAST),
        .RRESP(m_axi_gmem_RRESP)
    );
