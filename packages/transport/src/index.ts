export const PACKAGE_NAME = "@tapwire/transport";
