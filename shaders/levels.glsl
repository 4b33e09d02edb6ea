// The output grids of a multi-scale head (ops::Levels), for a kernel whose push block holds
// `level_count`, `strides[3]`, `input_h` and `input_w`: level l's grid is
// (input_h / strides[l]) × (input_w / strides[l]) cells, and in every channel plane its cells
// follow level l − 1's, row by row. Include after the push block.

uint level_grid_w(uint l) {
    return pc.input_w / pc.strides[l];
}

uint level_cells(uint l) {
    return (pc.input_h / pc.strides[l]) * level_grid_w(l);
}

uint total_cells() {
    uint t = 0u;
    for (uint l = 0u; l < pc.level_count; l++) {
        t += level_cells(l);
    }
    return t;
}

// The level cell q of a plane belongs to; `offset` is where that level's cells start.
uint level_of_cell(uint q, out uint offset) {
    offset = 0u;
    for (uint l = 0u; l + 1u < pc.level_count; l++) {
        uint cells = level_cells(l);
        if (q < offset + cells) {
            return l;
        }
        offset += cells;
    }
    return pc.level_count - 1u;
}

// The level a box whose longer side is `side` pixels goes to (ops::LEVEL_SPLIT = 6).
uint level_of_side(float side) {
    for (uint l = 0u; l + 1u < pc.level_count; l++) {
        if (side < 6.0 * float(pc.strides[l])) {
            return l;
        }
    }
    return pc.level_count - 1u;
}
